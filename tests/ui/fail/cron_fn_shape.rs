// Generic, lifetime-generic, `where`, `unsafe`, and more than one parameter.

#[forge::cron("0 * * * *")]
async fn generic<T: Send>(_: forge::CronContext) {}

#[forge::cron("0 * * * *")]
async fn with_lifetime<'a>() {}

#[forge::cron("0 * * * *")]
async fn with_where()
where
    u8: Copy,
{
}

#[forge::cron("0 * * * *")]
async unsafe fn not_safe() {}

#[forge::cron("0 * * * *")]
async fn two_params(_ctx: forge::CronContext, _extra: u32) {}

#[forge::cron("0 * * * *")]
async fn impl_trait(_ctx: impl Send) {}

fn main() {}
