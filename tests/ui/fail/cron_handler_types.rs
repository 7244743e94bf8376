// Type errors the compiler reports: at the user's own parameter and return types.

#[forge::cron("0 * * * *")]
async fn wrong_context(_ctx: String) {}

#[forge::cron("0 * * * *")]
async fn wrong_return() -> Result<(), String> {
    Ok(())
}

#[forge::cron("0 * * * *")]
async fn returns_a_value() -> u32 {
    1
}

fn main() {}
