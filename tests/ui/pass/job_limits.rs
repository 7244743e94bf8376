//! A kind's cluster-wide limits as the attribute declares them, and the options they produce.

use std::time::Duration;

use forge::jobs::{Job, JobOptions, Rate};

#[derive(serde::Serialize, serde::Deserialize)]
struct Sync {
    customer_id: i64,
}

#[forge::job(global_concurrency = 4, rate = "100/1m", rate_key = "customer_id")]
async fn sync_customer(_args: Sync) {}

fn main() {
    let expected = JobOptions::new()
        .global_concurrency(4)
        .rate(Rate {
            count: 100,
            per: Duration::from_secs(60),
        })
        .rate_key("customer_id");
    assert_eq!(sync_customer.options(), expected);
    assert_eq!(
        sync_customer.options().limits().to_string(),
        "global 4, rate 100/1m per customer_id"
    );
}
