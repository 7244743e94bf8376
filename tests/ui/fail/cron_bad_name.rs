// Explicit names that are not valid, and a fn name that is not a valid default.

#[forge::cron("0 * * * *", name = "nightly report")]
async fn a() {}

#[forge::cron("0 * * * *", name = "")]
async fn b() {}

#[forge::cron("0 * * * *")]
async fn _private() {}

fn main() {}
