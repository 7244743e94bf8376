// No parameter, one too many, and only the context.

#[forge::job]
async fn nothing() {}

#[forge::job]
async fn three(_ctx: forge::JobContext, _args: String, _extra: u32) {}

#[forge::job]
async fn context_only(_ctx: forge::JobContext) {}

fn main() {}
