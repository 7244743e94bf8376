//! The `key = literal` options both attributes take: parsing with recovery (one mistake does
//! not hide the next), literal types, durations, duplicates, unknown names, and the name rules
//! both macros share.

use std::fmt::Display;
use std::time::Duration;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::parse::ParseStream;
use syn::{Expr, ExprLit, ExprUnary, Ident, Lit, LitStr, Token, UnOp};

/// Every problem found in one attribute, reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    pub(crate) fn to_compile_errors(&self) -> TokenStream {
        self.0
            .as_ref()
            .map_or_else(TokenStream::new, syn::Error::to_compile_error)
    }
}

/// The literal an option takes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Str,
    /// A string, one of these words: `(word, note)`, the note shown in parentheses in the
    /// message for any other word.
    Choice(&'static [(&'static str, &'static str)]),
    /// A duration string (forge-rules), more than zero.
    Duration,
    Int,
    Bool,
    /// A string, or the path of a function (`backoff = my_backoff`).
    StrOrFn,
    /// A non-empty list of strings, each one of `words` (`(word, note)`), passed to the
    /// builder as an array of the variants of the enum `ty` (`::forge::__private::<ty>`).
    Words {
        ty: &'static str,
        words: &'static [(&'static str, &'static str)],
    },
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Str | Kind::Choice(_) => "a string",
            Kind::Duration => "a duration string with a unit",
            Kind::Int => "an integer",
            Kind::Bool => "`true` or `false`",
            Kind::StrOrFn => "a string or a function's name",
            Kind::Words { .. } => "a list of strings",
        }
    }
}

/// One option of an attribute.
pub(crate) struct Spec {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    /// A valid value as written in the attribute, for messages.
    pub(crate) example: &'static str,
}

/// What an attribute accepts.
pub(crate) struct Attr {
    /// `cron` or `job`.
    pub(crate) name: &'static str,
    pub(crate) specs: &'static [Spec],
    /// Names people reach for, and the option they mean.
    pub(crate) aliases: &'static [(&'static str, &'static str)],
}

impl Attr {
    /// "`name`, `role` and `tz`".
    pub(crate) fn option_list(&self) -> String {
        let names: Vec<String> = self.specs.iter().map(|s| format!("`{}`", s.name)).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => names.concat(),
        }
    }
}

/// A well-typed option value.
pub(crate) enum Value {
    Str(LitStr),
    Duration(Duration),
    /// The value with its sign, and the literal (with its `-`) for error spans.
    Int(i128, Expr),
    Bool(bool),
    /// A function's path, for [`Kind::StrOrFn`].
    Path(syn::Path),
    /// The strings of a list, for [`Kind::Words`], and the list (for error spans).
    Words(Vec<LitStr>, Expr),
}

/// The options given, each with a value of the right literal type.
#[derive(Default)]
pub(crate) struct Options {
    entries: Vec<(&'static str, Ident, Value)>,
}

impl Options {
    /// The options as written, in order: their specs (in `attr`, which parsed them) and
    /// values.
    pub(crate) fn iter<'a>(
        &'a self,
        attr: &'a Attr,
    ) -> impl Iterator<Item = (&'a Spec, &'a Value)> + 'a {
        self.entries.iter().filter_map(move |(name, _, value)| {
            let spec = attr.specs.iter().find(|spec| spec.name == *name)?;
            Some((spec, value))
        })
    }

    fn value(&self, name: &str) -> Option<&Value> {
        self.entries
            .iter()
            .find(|(key, _, _)| *key == name)
            .map(|(_, _, value)| value)
    }

    /// The option's name as written, to point errors at.
    pub(crate) fn key(&self, name: &str) -> Option<&Ident> {
        self.entries
            .iter()
            .find(|(key, _, _)| *key == name)
            .map(|(_, ident, _)| ident)
    }

    pub(crate) fn str(&self, name: &str) -> Option<&LitStr> {
        match self.value(name) {
            Some(Value::Str(lit)) => Some(lit),
            _ => None,
        }
    }

    pub(crate) fn duration(&self, name: &str) -> Option<Duration> {
        match self.value(name) {
            Some(Value::Duration(duration)) => Some(*duration),
            _ => None,
        }
    }

    pub(crate) fn path(&self, name: &str) -> Option<&syn::Path> {
        match self.value(name) {
            Some(Value::Path(path)) => Some(path),
            _ => None,
        }
    }

    pub(crate) fn int(&self, name: &str) -> Option<(i128, &Expr)> {
        match self.value(name) {
            Some(Value::Int(value, expr)) => Some((*value, expr)),
            _ => None,
        }
    }
}

/// Parses `key = literal, ...` to the end of `input`. Every problem goes to `errors` and the
/// option it is in is skipped, so that one mistake does not hide the next.
pub(crate) fn parse(input: ParseStream<'_>, attr: &Attr, errors: &mut Errors) -> Options {
    let mut options = Options::default();
    let mut seen: Vec<&'static str> = Vec::new();
    while !input.is_empty() {
        match parse_one(input, attr, &mut seen) {
            Ok((name, ident, value)) => options.entries.push((name, ident, value)),
            Err(err) => {
                errors.push(err);
                skip_to_comma(input);
            }
        }
        if input.is_empty() {
            break;
        }
        if let Err(err) = input.parse::<Token![,]>() {
            errors.push(err);
            skip_to_comma(input);
            let _ = input.parse::<Option<Token![,]>>();
        }
    }
    options
}

/// Consumes tokens up to (not including) the next top-level `,`, and returns them.
pub(crate) fn skip_to_comma(input: ParseStream<'_>) -> TokenStream {
    let mut skipped = TokenStream::new();
    while !input.is_empty() && !input.peek(Token![,]) {
        match input.parse::<TokenTree>() {
            Ok(token) => skipped.extend([token]),
            Err(_) => break,
        }
    }
    skipped
}

fn parse_one(
    input: ParseStream<'_>,
    attr: &Attr,
    seen: &mut Vec<&'static str>,
) -> syn::Result<(&'static str, Ident, Value)> {
    let key = Ident::parse_any(input).map_err(|_| {
        input.error(format!(
            "expected an option written `name = value`; #[{}] takes {}",
            attr.name,
            attr.option_list()
        ))
    })?;
    let written = key.unraw().to_string();
    let Some(spec) = attr.specs.iter().find(|spec| spec.name == written) else {
        return Err(unknown(attr, &key, &written));
    };
    if seen.contains(&spec.name) {
        return Err(syn::Error::new(
            key.span(),
            format!("`{}` is given twice: keep one", spec.name),
        ));
    }
    seen.push(spec.name);
    let write_it = || format!("write `{} = {}`", spec.name, spec.example);
    if input.is_empty() || input.peek(Token![,]) {
        return Err(syn::Error::new(
            key.span(),
            format!("`{}` needs a value: {}", spec.name, write_it()),
        ));
    }
    if !input.peek(Token![=]) {
        return Err(input.error(format!(
            "expected `=` after `{}`: {}",
            spec.name,
            write_it()
        )));
    }
    input.parse::<Token![=]>()?;
    let expr: Expr = input.parse()?;
    let value = literal(&expr, spec)?;
    Ok((spec.name, key, value))
}

fn unknown(attr: &Attr, key: &Ident, written: &str) -> syn::Error {
    let alias = attr
        .aliases
        .iter()
        .find(|(alias, _)| *alias == written)
        .map(|(_, meant)| *meant);
    let close = || {
        let limit = (written.len() / 3).max(1);
        attr.specs
            .iter()
            .map(|spec| (edit_distance(written, spec.name), spec.name))
            .filter(|(distance, _)| *distance <= limit)
            .min()
            .map(|(_, name)| name)
    };
    let hint = alias
        .or_else(close)
        .map_or_else(String::new, |name| format!(" (did you mean `{name}`?)"));
    // Without the list of options (the "did you mean" hint is the help): tests snapshot this
    // message, and a new option must not change it. The list is the attribute's
    // documentation and the guide's table (docs/src/crons.md).
    syn::Error::new(
        key.span(),
        format!(
            "unknown option `{written}`{hint}; the options of #[{}] are listed in its documentation",
            attr.name
        ),
    )
}

/// Levenshtein distance; names are short.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

fn literal(expr: &Expr, spec: &Spec) -> syn::Result<Value> {
    if let (Kind::StrOrFn, Expr::Path(path)) = (spec.kind, expr) {
        return Ok(Value::Path(path.path.clone()));
    }
    if let Kind::Words { .. } = spec.kind {
        return words(expr, spec);
    }
    let (lit, negative) = match expr {
        Expr::Lit(ExprLit { lit, .. }) => (lit, false),
        Expr::Unary(ExprUnary {
            op: UnOp::Neg(_),
            expr: inner,
            ..
        }) if matches!(**inner, Expr::Lit(_)) => match &**inner {
            Expr::Lit(ExprLit { lit, .. }) => (lit, true),
            _ => unreachable!("matched above"),
        },
        _ => {
            return Err(syn::Error::new_spanned(
                expr,
                format!(
                    "`{}` takes a literal, such as `{} = {}`: attribute options are read at \
                     compile time, so constants and expressions cannot be used",
                    spec.name, spec.name, spec.example
                ),
            ));
        }
    };
    let value = match (spec.kind, lit, negative) {
        (Kind::Str | Kind::Choice(_) | Kind::StrOrFn, Lit::Str(lit), false) => {
            Value::Str(lit.clone())
        }
        (Kind::Duration, Lit::Str(lit), false) => Value::Duration(duration(spec.name, lit)?),
        (Kind::Int, Lit::Int(lit), _) => {
            let value: i128 = lit.base10_parse()?;
            Value::Int(if negative { -value } else { value }, expr.clone())
        }
        (Kind::Bool, Lit::Bool(lit), false) => Value::Bool(lit.value),
        _ => {
            return Err(syn::Error::new_spanned(
                expr,
                format!(
                    "`{}` takes {}, such as `{} = {}`",
                    spec.name,
                    spec.kind.describe(),
                    spec.name,
                    spec.example
                ),
            ));
        }
    };
    Ok(value)
}

/// `["word", ...]`: string literals only.
fn words(expr: &Expr, spec: &Spec) -> syn::Result<Value> {
    let takes = || {
        format!(
            "`{}` takes a list of strings, such as `{} = {}`",
            spec.name, spec.name, spec.example
        )
    };
    let Expr::Array(array) = expr else {
        return Err(syn::Error::new_spanned(expr, takes()));
    };
    let lits = array
        .elems
        .iter()
        .map(|elem| match elem {
            Expr::Lit(ExprLit {
                lit: Lit::Str(lit), ..
            }) => Ok(lit.clone()),
            other => Err(syn::Error::new_spanned(other, takes())),
        })
        .collect::<syn::Result<Vec<LitStr>>>()?;
    Ok(Value::Words(lits, expr.clone()))
}

/// Durations as in `forge.toml` (forge-rules: the same parser and bounds), with the same
/// message.
fn duration(option: &str, lit: &LitStr) -> syn::Result<Duration> {
    let text = lit.value();
    let duration = forge_rules::parse_duration(&text)
        .map_err(|message| syn::Error::new(lit.span(), format!("`{option}`: {message}")))?;
    if duration.is_zero() {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{option}` must be longer than zero, such as \"5s\", \"250ms\" or \"1m 30s\""),
        ));
    }
    Ok(duration)
}

/// One of a fixed set of words; `valid` is `(word, note)`, the note shown in parentheses.
pub(crate) fn one_of(
    option: &str,
    lit: &LitStr,
    valid: &[(&str, &str)],
    errors: &mut Errors,
) -> Option<String> {
    let text = lit.value();
    if valid.iter().any(|(word, _)| *word == text) {
        return Some(text);
    }
    let words: Vec<String> = valid
        .iter()
        .map(|(word, note)| {
            if note.is_empty() {
                format!("{word:?}")
            } else {
                format!("{word:?} ({note})")
            }
        })
        .collect();
    let words = match words.split_last() {
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    errors.at(
        lit.span(),
        format!("invalid {option} {text:?}: use {words}"),
    );
    None
}

/// Checks a name given in an option against its rule (forge-rules, the same the runtime
/// uses); `example` completes the message when the rule has none.
pub(crate) fn check_name(
    kind: forge_rules::Name,
    lit: &LitStr,
    example: Option<&str>,
    errors: &mut Errors,
) -> Option<String> {
    let name = lit.value();
    match forge_rules::check_name(kind, &name) {
        Ok(()) => Some(name),
        Err(err) => {
            let message = match example {
                Some(example) => format!("{err}, such as {example:?}"),
                None => err.to_string(),
            };
            errors.at(lit.span(), message);
            None
        }
    }
}

/// A name taken from the fn's identifier (a cron's name, a job's kind), checked against its
/// rule; `how` says how to give another.
pub(crate) fn name_from_ident(
    kind: forge_rules::Name,
    ident: &syn::Ident,
    how: &str,
    errors: &mut Errors,
) -> String {
    let name = ident.unraw().to_string();
    if forge_rules::check_name(kind, &name).is_err() {
        errors.at(
            ident.span(),
            format!(
                "the {} defaults to the fn's name, and `{name}` is not valid (use {}): give one with {how}",
                kind.noun(),
                kind.rule()
            ),
        );
    }
    name
}

/// The call of the builder method named after the option, taking its value: a string as
/// written, a duration as a `Duration`, an integer or a bool as written, a word of a choice as
/// the variant of the enum named after the option (`catch_up = "all"` is
/// `.catch_up(::forge::__private::CatchUp::All)`). So a new option of the table is its
/// builder method, with nothing to write here. `None` for an invalid word (reported in
/// `errors`).
pub(crate) fn builder_call(spec: &Spec, value: &Value, errors: &mut Errors) -> Option<TokenStream> {
    let method = Ident::new(spec.name, Span::call_site());
    let argument = match (spec.kind, value) {
        (Kind::Choice(words), Value::Str(lit)) => {
            let word = one_of(spec.name, lit, words, errors)?;
            let ty = Ident::new(&camel_case(spec.name), Span::call_site());
            let variant = Ident::new(&camel_case(&word), Span::call_site());
            quote!(::forge::__private::#ty::#variant)
        }
        (_, Value::Str(lit)) => quote!(#lit),
        (_, Value::Duration(duration)) => duration_tokens(*duration),
        (_, Value::Int(value, _)) => {
            // Unsuffixed: the builder's parameter type decides (the value was checked).
            let magnitude = proc_macro2::Literal::u128_unsuffixed(value.unsigned_abs());
            if *value < 0 {
                quote!(-#magnitude)
            } else {
                quote!(#magnitude)
            }
        }
        (_, Value::Bool(value)) => quote!(#value),
        (_, Value::Path(path)) => quote!(#path),
        (Kind::Words { ty, words }, Value::Words(lits, list)) => {
            if lits.is_empty() {
                errors.spanned(
                    list,
                    format!(
                        "`{}` is empty: name at least one, such as `{} = {}`",
                        spec.name, spec.name, spec.example
                    ),
                );
                return None;
            }
            let ty = Ident::new(ty, Span::call_site());
            let variants = lits
                .iter()
                .map(|lit| {
                    let word = one_of(spec.name, lit, words, errors)?;
                    Some(Ident::new(&camel_case(&word), Span::call_site()))
                })
                .collect::<Vec<_>>();
            let variants: Vec<Ident> = variants.into_iter().collect::<Option<_>>()?;
            quote!([#(::forge::__private::#ty::#variants),*])
        }
        (_, Value::Words(..)) => return None,
    };
    Some(quote!(.#method(#argument)))
}

/// `catch_up` -> `CatchUp`.
fn camel_case(snake: &str) -> String {
    snake
        .split('_')
        .map(|part| {
            let mut chars = part.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// A `Duration` as a const expression.
pub(crate) fn duration_tokens(duration: Duration) -> TokenStream {
    let secs = duration.as_secs();
    let nanos = duration.subsec_nanos();
    quote!(::core::time::Duration::new(#secs, #nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("catchup", "catch_up"), 1);
        assert_eq!(edit_distance("timout", "timeout"), 1);
        assert_eq!(edit_distance("", "tz"), 2);
        assert_eq!(edit_distance("role", "role"), 0);
    }
}
