#[forge::cron("0 * * * *", timeout = "30s", overlap = "skip", timeout = "1m")]
async fn compact() {}

fn main() {}
