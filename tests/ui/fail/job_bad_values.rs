// A queue name, a kind, a flag and a duration that are not valid.

#[forge::job(queue = "mail queue")]
async fn a(_args: String) {}

#[forge::job(name = "send email")]
async fn b(_args: String) {}

#[forge::job(unique = "yes")]
async fn c(_args: String) {}

#[forge::job(unique)]
async fn d(_args: String) {}

#[forge::job(timeout = "forever")]
async fn e(_args: String) {}

fn main() {}
