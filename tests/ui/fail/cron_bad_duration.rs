#[forge::cron("0 * * * *", timeout = "soon")]
async fn a() {}

#[forge::cron("0 * * * *", timeout = "30")]
async fn b() {}

#[forge::cron("0 * * * *", catch_up_window = "0s")]
async fn c() {}

fn main() {}

#[forge::cron("0 * * * *", catch_up = "all", catch_up_window = "300000y")]
async fn absurd_window() {}
