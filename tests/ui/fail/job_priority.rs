#[forge::job(priority = 40000)]
async fn too_high(_args: String) {}

#[forge::job(priority = -40000)]
async fn too_low(_args: String) {}

fn main() {}
