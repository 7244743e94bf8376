// A value of the wrong literal type, a constant instead of a literal, an option without a
// value, and a missing `=`; all reported at once.

const NAME: &str = "compact";

#[forge::cron("0 * * * *", timeout = 30, name = NAME, role = true)]
async fn a() {}

#[forge::cron("0 * * * *", overlap, catch_up "all")]
async fn b() {}

fn main() {}
