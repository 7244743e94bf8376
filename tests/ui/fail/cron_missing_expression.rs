// No arguments at all, and options without the expression.

#[forge::cron]
async fn no_arguments() {}

#[forge::cron(name = "compact")]
async fn options_only() {}

fn main() {}
