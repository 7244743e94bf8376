#[forge::job(retries = 5)]
async fn a(_args: String) {}

#[forge::job(queu = "mailers")]
async fn b(_args: String) {}

fn main() {}
