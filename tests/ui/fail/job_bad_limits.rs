// A kind's limits that are not valid: a rate that is not one, a global concurrency of 0, a
// rate key without a rate, limits on a role's kind.

#[forge::job(rate = "100 a minute")]
async fn a(_args: String) {}

#[forge::job(global_concurrency = 0)]
async fn b(_args: String) {}

#[forge::job(rate_key = "customer_id")]
async fn c(_args: String) {}

#[forge::job(role = "reports", global_concurrency = 2)]
async fn d(_args: String) {}

fn main() {}
