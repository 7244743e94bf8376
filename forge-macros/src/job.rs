//! `#[job(options...)]`.

use std::time::Duration;

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Ident, ReturnType, Type};

use crate::handler::{HandlerFn, check_args_type, check_context_type};
use forge_rules::Name;

use crate::options::{self, Attr, Errors, Kind, Options, Spec, Value};

const ATTR: Attr = Attr {
    name: "job",
    specs: &[
        Spec {
            name: "name",
            kind: Kind::Str,
            example: "\"send_email\"",
        },
        Spec {
            name: "queue",
            kind: Kind::Str,
            example: "\"mailers\"",
        },
        Spec {
            name: "role",
            kind: Kind::Str,
            example: "\"reports\"",
        },
        Spec {
            name: "max_attempts",
            kind: Kind::Int,
            example: "5",
        },
        Spec {
            name: "backoff",
            kind: Kind::StrOrFn,
            example: "\"exponential\"",
        },
        Spec {
            name: "backoff_base",
            kind: Kind::Duration,
            example: "\"2s\"",
        },
        Spec {
            name: "backoff_max",
            kind: Kind::Duration,
            example: "\"10m\"",
        },
        Spec {
            name: "timeout",
            kind: Kind::Duration,
            example: "\"30s\"",
        },
        Spec {
            name: "priority",
            kind: Kind::Int,
            example: "1",
        },
        Spec {
            name: "unique",
            kind: Kind::Bool,
            example: "true",
        },
        Spec {
            name: "max_snoozes",
            kind: Kind::Int,
            example: "10",
        },
        Spec {
            name: "unique_period",
            kind: Kind::Duration,
            example: "\"1h\"",
        },
        Spec {
            name: "unique_mode",
            kind: Kind::Choice(&[
                ("keep", "the default"),
                ("replace", ""),
                ("keep_earliest_run_at", ""),
            ]),
            example: "\"replace\"",
        },
        Spec {
            name: "unique_states",
            kind: Kind::Words {
                ty: "JobState",
                words: &[
                    ("pending", ""),
                    ("available", ""),
                    ("scheduled", ""),
                    ("running", ""),
                    ("retryable", ""),
                    ("completed", ""),
                    ("dead", ""),
                    ("cancelled", ""),
                ],
            },
            example: "[\"scheduled\", \"completed\"]",
        },
        Spec {
            name: "global_concurrency",
            kind: Kind::Int,
            example: "4",
        },
        Spec {
            name: "rate",
            kind: Kind::Str,
            example: "\"100/1m\"",
        },
        Spec {
            name: "rate_key",
            kind: Kind::Str,
            example: "\"customer_id\"",
        },
    ],
    aliases: &[
        ("kind", "name"),
        ("attempts", "max_attempts"),
        ("retries", "max_attempts"),
        ("max_retries", "max_attempts"),
        ("retry", "backoff"),
        ("delay", "backoff_base"),
        ("backoff_delay", "backoff_base"),
    ],
};

const EXAMPLE: &str = "async fn send_email(ctx: forge::JobContext, args: SendEmail) { ... }";

/// How retries are delayed, as declared.
enum Backoff {
    /// `base` `None`: the runtime's default base.
    Exponential {
        base: Option<Duration>,
        max: Option<Duration>,
    },
    Fixed(Duration),
    /// `backoff = my_backoff`: the user's `fn(u32, &JobError) -> Duration`.
    Custom(syn::Path),
}

/// Everything the attribute said, validated.
struct Definition {
    kind: String,
    /// The `JobOptions` builder calls of the options (see [`builder_call`]).
    calls: Vec<TokenStream>,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let handler = HandlerFn::parse(item, "job", EXAMPLE)?;
    let mut errors = Errors::default();
    handler.check_shape("job", &mut errors);
    let params = handler.params();
    let (ctx_param, args_param) = split_params(&handler, &params, &mut errors);
    if let Some(ctx) = ctx_param {
        check_context_type(&ctx.ty, "job", "forge::JobContext", &mut errors);
    }
    let args_ty: Type = match args_param {
        Some(args) if check_args_type(&args.ty, &mut errors) => (*args.ty).clone(),
        // Nothing, or a type that cannot be `Args`: `()` keeps the stub below error-free.
        _ => syn::parse_quote!(()),
    };
    let definition = parse_definition(args, handler.ident(), &mut errors);
    // At the user's type: "private type in public interface" for a `pub` job whose arguments
    // type is private, and unmet serde bounds, are reported there.
    let args_item = quote_spanned!(args_ty.span()=> type Args = #args_ty;);
    if !errors.is_empty() {
        return Ok(stub(&handler, &args_item, errors));
    }
    let Definition { kind, calls } = definition;
    let (ctx, call) = call_tokens(&handler, ctx_param);
    let item = handler.item("job");
    let ident = handler.ident();
    let cfgs = handler.cfgs();
    Ok(quote! {
        #item

        #(#cfgs)*
        impl ::forge::__private::Job for #ident {
            #args_item
            const KIND: &'static str = #kind;

            fn options(&self) -> ::forge::__private::JobOptions {
                ::forge::__private::JobOptions::new()
                #(#calls)*
            }

            fn run(
                &self,
                #ctx: ::forge::__private::JobContext,
                args: Self::Args,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<(), ::forge::__private::JobError>,
            > + ::core::marker::Send {
                async move { #call }
            }
        }

        #(#cfgs)*
        ::forge::__private::inventory::submit! {
            ::forge::__private::JobRegistration {
                register: |registry| registry.add(#ident),
            }
        }
    })
}

/// The context and arguments parameters, by the fn's shape: `(args)` or `(ctx, args)`.
fn split_params<'a>(
    handler: &HandlerFn,
    params: &[&'a syn::PatType],
    errors: &mut Errors,
) -> (Option<&'a syn::PatType>, Option<&'a syn::PatType>) {
    match params {
        [only] if is_job_context(&only.ty) => {
            errors.spanned(
                &only.ty,
                "a #[job] fn takes the job's arguments after the context: \
                 `(ctx: forge::JobContext, args: T)`; a job without arguments can take `args: ()`",
            );
            (None, None)
        }
        [args] => (None, Some(*args)),
        [ctx, args] => (Some(*ctx), Some(*args)),
        [] => {
            errors.at(
                handler.sig.paren_token.span.join(),
                "a #[job] fn takes the job's arguments: `(args: T)` or \
                 `(ctx: forge::JobContext, args: T)`, where `T` implements serde's `Serialize` and \
                 `Deserialize` (`args: ()` for a job without arguments)",
            );
            (None, None)
        }
        [_, _, extra, ..] => {
            errors.spanned(
                extra,
                "a #[job] fn takes at most two parameters: `(ctx: forge::JobContext, args: T)`; \
                 put everything the job needs into the arguments type `T`",
            );
            (None, None)
        }
    }
}

/// The user's fn and the errors, plus a stub `Job` impl so that registering it causes no
/// further errors.
fn stub(handler: &HandlerFn, args_item: &TokenStream, errors: Errors) -> TokenStream {
    let item = handler.item("job");
    let ident = handler.ident();
    let cfgs = handler.cfgs();
    let kind = ident.unraw().to_string();
    let errors = errors.to_compile_errors();
    quote! {
        #item
        #(#cfgs)*
        impl ::forge::__private::Job for #ident {
            #args_item
            const KIND: &'static str = #kind;
            fn run(
                &self,
                _: ::forge::__private::JobContext,
                _: Self::Args,
            ) -> impl ::core::future::Future<
                Output = ::core::result::Result<(), ::forge::__private::JobError>,
            > + ::core::marker::Send {
                ::core::future::pending()
            }
        }
        #errors
    }
}

/// The `JobOptions` builder call of an option (see [`options::builder_call`]). `None` for the
/// kind (`name`), and for the three options of the backoff, which make one call (see
/// [`backoff`]).
fn builder_call(spec: &Spec, value: &Value, errors: &mut Errors) -> Option<TokenStream> {
    match spec.name {
        "name" | "backoff" | "backoff_base" | "backoff_max" | "rate" => None,
        _ => options::builder_call(spec, value, errors),
    }
}

fn backoff_tokens(backoff: Backoff) -> TokenStream {
    match backoff {
        // At the user's path: a function of another signature is reported there.
        Backoff::Custom(path) => {
            quote_spanned!(path.span()=> ::forge::__private::Backoff::custom(#path))
        }
        Backoff::Fixed(delay) => {
            let delay = options::duration_tokens(delay);
            quote!(::forge::__private::Backoff::fixed(#delay))
        }
        Backoff::Exponential { base, max } => {
            let mut tokens = match base {
                Some(base) => {
                    let base = options::duration_tokens(base);
                    quote!(::forge::__private::Backoff::exponential(#base))
                }
                None => {
                    quote!(<::forge::__private::Backoff as ::core::default::Default>::default())
                }
            };
            if let Some(max) = max {
                let max = options::duration_tokens(max);
                tokens.extend(quote!(.capped(#max)));
            }
            tokens
        }
    }
}

/// The context parameter and the call of the user's fn. Spans: a context of the wrong type is
/// reported at the user's parameter type, a return type that is not `()` or
/// `Result<T: Serialize, E: Into<JobError>>` at the user's return type.
fn call_tokens(
    handler: &HandlerFn,
    ctx_param: Option<&syn::PatType>,
) -> (TokenStream, TokenStream) {
    let ident = handler.ident();
    let output_span = match &handler.sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => ident.span(),
    };
    let mut callee = ident.clone();
    callee.set_span(output_span);
    let into_result =
        quote_spanned!(output_span=> ::forge::__private::IntoJobResult::into_job_result);
    // The handler's `Ok` value becomes the job's output, through a clone of its context.
    let (ctx, call) = match ctx_param {
        Some(param) => {
            let arg = quote_spanned!(param.ty.span()=> ctx);
            (
                quote!(ctx),
                quote_spanned!(output_span=> {
                    let output_to = ::core::clone::Clone::clone(&ctx);
                    #into_result(#callee::run(#arg, args).await, &output_to)
                }),
            )
        }
        None => (
            quote!(ctx),
            quote_spanned!(output_span=> #into_result(#callee::run(args).await, &ctx)),
        ),
    };
    (ctx, call)
}

/// Parses and validates the attribute's arguments; problems go to `errors`.
fn parse_definition(args: TokenStream, ident: &Ident, errors: &mut Errors) -> Definition {
    let options = Parser::parse2(
        |input: ParseStream<'_>| Ok(options::parse(input, &ATTR, errors)),
        args,
    )
    .unwrap_or_else(|err| {
        errors.push(err);
        Options::default()
    });

    let kind = match options.str("name") {
        Some(lit) => options::check_name(Name::JobKind, lit, Some("send_email"), errors)
            .unwrap_or_else(|| lit.value()),
        None => options::name_from_ident(Name::JobKind, ident, "#[job(name = \"...\")]", errors),
    };
    // Checked here, passed as written by `builder_call`.
    if let Some(lit) = options.str("queue") {
        options::check_name(Name::Queue, lit, Some("mailers"), errors);
    }
    if let Some(lit) = options.str("role") {
        options::check_name(Name::Role, lit, None, errors);
    }
    if let Some((value, expr)) = options.int("max_attempts") {
        match u32::try_from(value) {
            Ok(0) => errors.spanned(
                expr,
                "`max_attempts` must be at least 1: it counts the first attempt too",
            ),
            Ok(_) => {}
            Err(_) => errors.spanned(
                expr,
                format!("`max_attempts` must be from 1 to {}", u32::MAX),
            ),
        }
    }
    if let Some((value, expr)) = options.int("max_snoozes")
        && u32::try_from(value).is_err()
    {
        errors.spanned(
            expr,
            format!("`max_snoozes` must be from 0 to {}", u32::MAX),
        );
    }
    if let Some((value, expr)) = options.int("priority")
        && i16::try_from(value).is_err()
    {
        errors.spanned(
            expr,
            format!(
                "`priority` must fit in an i16, from {} to {} (lower runs first; the \
                 default is 0)",
                i16::MIN,
                i16::MAX
            ),
        );
    }
    let mut calls: Vec<TokenStream> = options
        .iter(&ATTR)
        .filter_map(|(spec, value)| builder_call(spec, value, errors))
        .collect();
    if let Some(rate) = limits(&options, errors) {
        calls.push(rate);
    }
    if let Some(backoff) = backoff(&options, errors) {
        let backoff = backoff_tokens(backoff);
        calls.push(quote!(.backoff(#backoff)));
    }
    Definition { kind, calls }
}

/// The kind's limits, checked with the runtime's rules: `global_concurrency` and `rate`
/// within [`forge_rules::MAX_LIMIT`], `rate_key` only with a rate, none on a role's kind. The
/// rate's builder call (a parsed `Rate`), if any.
fn limits(options: &Options, errors: &mut Errors) -> Option<TokenStream> {
    let limit = forge_rules::MAX_LIMIT;
    if let Some((value, expr)) = options.int("global_concurrency")
        && !(1..=i128::from(limit)).contains(&value)
    {
        errors.spanned(
            expr,
            format!("`global_concurrency` must be from 1 to {limit}: at most so many run at once on all nodes"),
        );
    }
    let rate = options.str("rate");
    if let Some(key) = options.str("rate_key") {
        if rate.is_none() {
            errors.spanned(
                key,
                "`rate_key` needs a rate (such as `rate = \"100/1m\"`): it says per which argument the rate holds",
            );
        } else if key.value().is_empty() {
            errors.spanned(
                key,
                "`rate_key` must name a top-level field of the arguments, such as \"customer_id\"",
            );
        }
    }
    if let Some(role) = options.str("role")
        && (rate.is_some() || options.int("global_concurrency").is_some())
    {
        errors.spanned(
            role,
            "a role's jobs run on its leader alone and no limit binds their claims: remove `global_concurrency` and `rate`, or the role",
        );
    }
    let rate = rate?;
    match forge_rules::parse_rate(&rate.value()) {
        Ok((count, per)) => {
            let per = options::duration_tokens(per);
            Some(quote!(.rate(::forge::__private::Rate { count: #count, per: #per })))
        }
        Err(message) => {
            errors.spanned(rate, message);
            None
        }
    }
}

/// `backoff`, `backoff_base` and `backoff_max` together.
fn backoff(options: &Options, errors: &mut Errors) -> Option<Backoff> {
    if let Some(path) = options.path("backoff") {
        for other in ["backoff_base", "backoff_max"] {
            if let Some(key) = options.key(other) {
                errors.at(
                    key.span(),
                    format!(
                        "`{other}` does not apply to a custom backoff: `{}` decides every delay",
                        quote!(#path).to_string().replace(' ', "")
                    ),
                );
            }
        }
        return Some(Backoff::Custom(path.clone()));
    }
    let strategy = options.str("backoff").and_then(|lit| {
        options::one_of(
            "backoff",
            lit,
            &[("exponential", "the default"), ("fixed", "")],
            errors,
        )
    });
    let base = options.duration("backoff_base");
    let max = options.duration("backoff_max");
    match strategy.as_deref() {
        Some("fixed") => {
            if let Some(key) = options.key("backoff_max") {
                errors.at(
                    key.span(),
                    "`backoff_max` only applies to `backoff = \"exponential\"`: a fixed backoff \
                     waits `backoff_base` every time",
                );
            }
            match base {
                Some(delay) => Some(Backoff::Fixed(delay)),
                None => {
                    if let Some(key) = options.key("backoff") {
                        errors.at(
                            key.span(),
                            "`backoff = \"fixed\"` needs the delay between attempts: add \
                             `backoff_base = \"30s\"`, for example",
                        );
                    }
                    None
                }
            }
        }
        _ if strategy.is_some() || base.is_some() || max.is_some() => {
            if let (Some(base), Some(max)) = (base, max)
                && max < base
                && let Some(key) = options.key("backoff_max")
            {
                errors.at(
                    key.span(),
                    format!(
                        "`backoff_max` ({}) is shorter than `backoff_base` ({}): the delays \
                         start at the base and grow up to the max",
                        forge_rules::format_duration(max),
                        forge_rules::format_duration(base)
                    ),
                );
            }
            Some(Backoff::Exponential { base, max })
        }
        _ => None,
    }
}

/// Whether `ty` names the job context (`JobContext`, `forge::JobContext`, ...).
fn is_job_context(ty: &Type) -> bool {
    matches!(ty, Type::Path(path)
        if path.path.segments.last().is_some_and(|segment| segment.ident == "JobContext"))
}
