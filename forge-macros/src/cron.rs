//! `#[cron("expression", options...)]`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Ident, LitStr, ReturnType, Token};

use crate::handler::{HandlerFn, check_context_type};
use forge_rules::Name;

use crate::options::{self, Attr, Errors, Kind, Options, Spec, Value};

const ATTR: Attr = Attr {
    name: "cron",
    specs: &[
        Spec {
            name: "name",
            kind: Kind::Str,
            example: "\"nightly_report\"",
        },
        Spec {
            name: "role",
            kind: Kind::Str,
            example: "\"reports\"",
        },
        Spec {
            name: "tz",
            kind: Kind::Str,
            example: "\"Europe/Berlin\"",
        },
        Spec {
            name: "catch_up",
            kind: Kind::Choice(&[("skip", ""), ("latest", "the default"), ("all", "")]),
            example: "\"all\"",
        },
        Spec {
            name: "catch_up_window",
            kind: Kind::Duration,
            example: "\"1h\"",
        },
        Spec {
            name: "overlap",
            kind: Kind::Choice(&[("skip", "the default"), ("wait", ""), ("allow", "")]),
            example: "\"wait\"",
        },
        Spec {
            name: "interrupted",
            kind: Kind::Choice(&[("rerun", "the default"), ("abandon", "")]),
            example: "\"abandon\"",
        },
        Spec {
            name: "timeout",
            kind: Kind::Duration,
            example: "\"30s\"",
        },
        Spec {
            name: "description",
            kind: Kind::Str,
            example: "\"compacts the event log\"",
        },
    ],
    aliases: &[
        ("timezone", "tz"),
        ("time_zone", "tz"),
        ("zone", "tz"),
        ("catchup", "catch_up"),
        ("window", "catch_up_window"),
        ("on_overlap", "overlap"),
    ],
};

const EXAMPLE: &str = "async fn compact(ctx: forge::CronContext) { ... }";

const MISSING_EXPRESSION: &str = "#[cron] needs a cron expression, as a string literal before \
    any option: such as #[cron(\"0 * * * *\")] (every hour), #[cron(\"*/10 * * * * *\")] (every \
    10 seconds: 6 fields, seconds first) or #[cron(\"@daily\")]";

/// Everything the attribute said, validated.
struct Definition {
    name: String,
    expression: String,
    tz: Option<String>,
    /// The builder calls of the other options (see [`builder_call`]).
    calls: Vec<TokenStream>,
}

pub(crate) fn expand(args: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let handler = HandlerFn::parse(item, "cron", EXAMPLE)?;
    let mut errors = Errors::default();
    handler.check_shape("cron", &mut errors);
    let params = handler.params();
    if let Some(extra) = params.get(1) {
        errors.spanned(
            extra,
            "a #[cron] fn takes at most one parameter, the `forge::CronContext`",
        );
    }
    if let Some(ctx) = params.first() {
        check_context_type(&ctx.ty, "cron", "forge::CronContext", &mut errors);
    }
    let definition = parse_definition(args, handler.ident(), &mut errors);

    let item = handler.item("cron");
    let ident = handler.ident();
    let cfgs = handler.cfgs();
    let Some(definition) = definition.filter(|_| errors.is_empty()) else {
        // Keep `compact` a `Cron` so that registering it causes no further errors.
        let errors = errors.to_compile_errors();
        return Ok(quote! {
            #item
            #(#cfgs)*
            impl ::forge::__private::IntoCron for #ident {
                fn cron_job(&self) -> ::forge::__private::Result<::forge::__private::CronJob> {
                    ::core::result::Result::Err(::forge::__private::Error::Registration {
                        message: ::std::string::String::from("#[cron] reported a compile error"),
                    })
                }
            }
            #errors
        });
    };

    let Definition {
        name,
        expression,
        tz,
        calls,
    } = definition;
    let schedule = match tz {
        Some(tz) => quote!(::forge::__private::Schedule::parse_in(#expression, #tz)?),
        None => quote!(::forge::__private::Schedule::parse(#expression)?),
    };

    // Spans: a context of the wrong type is reported at the user's parameter type, a return
    // type that is not `()` or `Result<(), E: Into<CronError>>` at the user's return type.
    let output_span = match &handler.sig.output {
        ReturnType::Type(_, ty) => ty.span(),
        ReturnType::Default => ident.span(),
    };
    let mut callee = ident.clone();
    callee.set_span(output_span);
    let (ctx, call) = match params.first() {
        Some(param) => {
            let arg = quote_spanned!(param.ty.span()=> ctx);
            (
                quote!(ctx),
                quote_spanned!(output_span=> #callee::run(#arg).await),
            )
        }
        None => (
            quote!(_),
            quote_spanned!(output_span=> #callee::run().await),
        ),
    };
    let into_result =
        quote_spanned!(output_span=> ::forge::__private::IntoCronResult::into_cron_result);

    Ok(quote! {
        #item

        #(#cfgs)*
        impl ::forge::__private::IntoCron for #ident {
            fn cron_job(&self) -> ::forge::__private::Result<::forge::__private::CronJob> {
                ::core::result::Result::Ok(
                    ::forge::__private::CronJob::new(
                        #name,
                        #schedule,
                        |#ctx: ::forge::__private::CronContext| async move {
                            #into_result(#call)
                        },
                    )
                    #(#calls)*
                )
            }
        }

        #(#cfgs)*
        ::forge::__private::inventory::submit! {
            ::forge::__private::CronRegistration {
                make: || ::forge::__private::IntoCron::cron_job(&#ident),
            }
        }
    })
}

/// Parses and validates the attribute's arguments; `None` when something is wrong (reported
/// in `errors`).
fn parse_definition(args: TokenStream, ident: &Ident, errors: &mut Errors) -> Option<Definition> {
    let (expression, options) =
        Parser::parse2(|input: ParseStream<'_>| Ok(parse_args(input, errors)), args)
            .unwrap_or_else(|err| {
                errors.push(err);
                (None, Options::default())
            });

    let tz = options.str("tz").and_then(|lit| {
        forge_cron::parse_timezone(&lit.value())
            .map_err(|err| errors.at(lit.span(), err))
            .ok()
            .map(|_| lit.value())
    });
    let expression = expression.and_then(|lit| {
        let text = lit.value();
        let parsed = match &tz {
            Some(tz) => forge_cron::Schedule::parse_in(&text, tz),
            None => forge_cron::Schedule::parse(&text),
        };
        parsed.map_err(|err| errors.at(lit.span(), err)).ok()?;
        Some(text)
    });
    let name = match options.str("name") {
        Some(lit) => options::check_name(Name::Cron, lit, Some("nightly_report"), errors)
            .unwrap_or_else(|| lit.value()),
        None => options::name_from_ident(
            Name::Cron,
            ident,
            "#[cron(\"...\", name = \"...\")]",
            errors,
        ),
    };
    let calls = options
        .iter(&ATTR)
        .filter_map(|(spec, value)| builder_call(spec, value, errors))
        .collect();
    Some(Definition {
        name,
        expression: expression?,
        tz,
        calls,
    })
}

/// The `CronJob` builder call of an option (see [`options::builder_call`]), a role as a
/// `Role`. `None` for the options the definition takes apart (`name`, `tz`), and for an invalid
/// value (reported in `errors`).
fn builder_call(spec: &Spec, value: &Value, errors: &mut Errors) -> Option<TokenStream> {
    match (spec.name, value) {
        ("name" | "tz", _) => None,
        ("role", Value::Str(lit)) => {
            options::check_name(Name::Role, lit, None, errors)?;
            Some(quote!(.role(::forge::__private::Role::new(#lit)?)))
        }
        _ => options::builder_call(spec, value, errors),
    }
}

/// `"expression", key = literal, ...`
fn parse_args(input: ParseStream<'_>, errors: &mut Errors) -> (Option<LitStr>, Options) {
    let expression = if input.peek(LitStr) {
        let lit = input.parse::<LitStr>().ok();
        if !input.is_empty()
            && let Err(err) = input.parse::<Token![,]>()
        {
            errors.push(err);
            options::skip_to_comma(input);
            let _ = input.parse::<Option<Token![,]>>();
        }
        lit
    } else if input.is_empty() || (input.peek(Ident::peek_any) && input.peek2(Token![=])) {
        errors.at(Span::call_site(), MISSING_EXPRESSION);
        None
    } else {
        // Something else where the expression belongs, such as #[cron(0 * * * *)].
        let written = options::skip_to_comma(input);
        errors.spanned(
            written,
            "the cron expression must be a string literal, such as #[cron(\"0 * * * *\")]",
        );
        let _ = input.parse::<Option<Token![,]>>();
        None
    };
    let options = options::parse(input, &ATTR, errors);
    (expression, options)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    /// An option is its `CronJob` builder call: `description` as written.
    #[test]
    fn description_is_its_builder_call() {
        let expansion = super::expand(
            quote!("0 * * * *", description = "compacts the event log"),
            quote!(
                async fn compact() {}
            ),
        )
        .unwrap()
        .to_string();
        assert!(
            expansion.contains(". description (\"compacts the event log\")"),
            "{expansion}"
        );
    }
}
