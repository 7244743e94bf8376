struct Reports;

impl Reports {
    #[forge::cron("0 * * * *")]
    async fn compact(&self) {}
}

fn main() {}
