#[forge::cron("0 9 * * *", tz = "berlin")]
async fn morning() {}

#[forge::cron("0 9 * * *", tz = "Mars/Olympus_Mons")]
async fn martian_morning() {}

fn main() {}
