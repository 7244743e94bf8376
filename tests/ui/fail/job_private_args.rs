// A `pub` job's arguments type must be public too: reported at the arguments type.

#[derive(serde::Serialize, serde::Deserialize)]
struct Private;

#[forge::job]
pub async fn leaks_private(_args: Private) {}

fn main() {}
