#[forge::cron("0 * * * *")]
struct Compact;

fn main() {}
