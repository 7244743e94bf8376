// Argument types the generated code cannot store: a reference, `impl Trait`.

#[forge::job]
async fn borrowed(_args: &str) {}

#[forge::job]
async fn opaque(_args: impl serde::Serialize) {}

fn main() {}
