// An alias people reach for, a typo, and something unrelated.

#[forge::cron("0 * * * *", timezone = "UTC")]
async fn a() {}

#[forge::cron("0 * * * *", catchup = "all")]
async fn b() {}

#[forge::cron("0 * * * *", retries = 3)]
async fn c() {}

fn main() {}
