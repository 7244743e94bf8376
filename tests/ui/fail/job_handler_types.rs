// Type errors the compiler reports: at the user's own types.

struct NotSerde;

#[forge::job]
async fn not_serde(_args: NotSerde) {}

#[forge::job]
async fn wrong_context(_ctx: String, _args: u32) {}

#[forge::job]
async fn wrong_return(_args: u32) -> Result<(), String> {
    Ok(())
}

fn main() {}
