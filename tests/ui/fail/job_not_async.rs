#[forge::job]
fn send_email(_args: String) {}

fn main() {
    // The struct is still there: registering it is not a second error.
    let _ = forge::Node::builder(forge::Config::default()).job(send_email);
}
