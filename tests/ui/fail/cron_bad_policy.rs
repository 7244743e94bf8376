#[forge::cron(
    "0 * * * *",
    catch_up = "sometimes",
    overlap = "queue",
    interrupted = "retry"
)]
async fn compact() {}

fn main() {}
