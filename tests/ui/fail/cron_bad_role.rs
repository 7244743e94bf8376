#[forge::cron("0 * * * *", role = "Reports")]
async fn a() {}

#[forge::cron("0 * * * *", role = "")]
async fn b() {}

fn main() {}
