// `unique_states` that are not a non-empty list of job states.

#[forge::job(unique = true, unique_states = ["scheduled", "finished", "dead"])]
async fn a(_args: String) {}

#[forge::job(unique = true, unique_states = [])]
async fn b(_args: String) {}

#[forge::job(unique = true, unique_states = "scheduled")]
async fn c(_args: String) {}

#[forge::job(unique = true, unique_states = ["scheduled", 3])]
async fn d(_args: String) {}

fn main() {}
