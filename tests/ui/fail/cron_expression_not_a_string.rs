#[forge::cron(0 * * * *)]
async fn compact() {}

fn main() {}
