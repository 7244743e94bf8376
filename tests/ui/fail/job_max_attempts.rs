#[forge::job(max_attempts = 0)]
async fn zero(_args: String) {}

#[forge::job(max_attempts = "5")]
async fn string(_args: String) {}

#[forge::job(max_attempts = -1)]
async fn negative(_args: String) {}

fn main() {}
