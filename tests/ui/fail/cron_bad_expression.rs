// A syntax error (out of range), a wrong number of fields, and a date that never comes.

#[forge::cron("0 25 * * *")]
async fn out_of_range() {}

#[forge::cron("* * *")]
async fn three_fields() {}

#[forge::cron("0 0 30 2 *")]
async fn february_30th() {}

fn main() {}
