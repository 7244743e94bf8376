//! Jobs taking only their arguments, returning `()` or `Result<(), E: Error>`.

use forge::jobs::Job;

#[forge::job]
async fn reindex(table: String) {
    let _ = table;
}

#[forge::job(name = "billing.invoice:v2")]
async fn invoice(ids: Vec<u64>) -> Result<(), std::io::Error> {
    let _ = ids;
    Ok(())
}

fn main() {
    assert_eq!(reindex::KIND, "reindex");
    assert_eq!(invoice::KIND, "billing.invoice:v2");
    let _run = reindex::run("users".to_owned());
}
