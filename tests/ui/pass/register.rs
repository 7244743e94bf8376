//! Registering macro-declared crons and jobs on a node builder, explicitly (type-checks; the
//! node is never started). The generated code is free of warnings and of `unsafe` in the
//! user's crate.

#![deny(warnings, unsafe_code)]

mod work {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub struct SendEmail {
        pub to: String,
    }

    #[forge::cron("0 * * * *")]
    pub async fn compact(ctx: forge::CronContext) -> Result<(), forge::CronError> {
        let _ = ctx;
        Ok(())
    }

    #[forge::job(queue = "mailers")]
    pub async fn send_email(args: SendEmail) {
        let _ = args.to;
    }
}

fn main() {
    let builder = forge::Node::builder(forge::Config::default())
        .auto_register(false)
        .cron(work::compact)
        .job(work::send_email);
    let _: forge::NodeBuilder = builder;
}
