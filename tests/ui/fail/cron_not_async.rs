#[forge::cron("0 * * * *")]
fn compact() {}

fn main() {
    // The struct is still there: registering it is not a second error.
    let _ = forge::Node::builder(forge::Config::default()).cron(compact);
}
