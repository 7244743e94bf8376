// An unknown strategy, a fixed backoff without its delay or with a max, a max below the base.

#[forge::job(backoff = "linear")]
async fn a(_args: String) {}

#[forge::job(backoff = "fixed")]
async fn b(_args: String) {}

#[forge::job(backoff = "fixed", backoff_base = "5s", backoff_max = "1m")]
async fn c(_args: String) {}

#[forge::job(backoff_base = "1m", backoff_max = "10s")]
async fn d(_args: String) {}

fn main() {}
