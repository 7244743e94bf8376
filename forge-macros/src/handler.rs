//! The function under the attribute: its shape checks, and the unit struct with an associated
//! `run` that it becomes.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Attribute, Block, FnArg, Ident, Item, PatType, Signature, Type, Visibility};

use crate::options::Errors;

/// An `async fn` under `#[cron]` or `#[job]`.
pub(crate) struct HandlerFn {
    /// Doc comments (and `#[doc]`): kept on the struct.
    docs: Vec<Attribute>,
    /// `#[cfg]` and `#[cfg_attr]`: repeated on everything generated.
    cfgs: Vec<Attribute>,
    /// Everything else (`#[allow]`, `#[tracing::instrument]`, ...): kept on `run`.
    others: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    block: Box<Block>,
}

impl HandlerFn {
    /// Fails only when nothing sensible can be generated (not a fn, or a method); the caller
    /// then emits the item unchanged with the error.
    pub(crate) fn parse(item: TokenStream, attr: &str, example: &str) -> syn::Result<HandlerFn> {
        let Ok(Item::Fn(function)) = syn::parse2::<Item>(item) else {
            return Err(syn::Error::new(
                Span::call_site(),
                format!("#[{attr}] goes on an async fn, such as `{example}`"),
            ));
        };
        if let Some(receiver) = function.sig.receiver() {
            return Err(syn::Error::new_spanned(
                receiver,
                format!(
                    "#[{attr}] cannot take `self`: put it on a free async fn, outside any impl \
                     block, such as `{example}`"
                ),
            ));
        }
        let mut docs = Vec::new();
        let mut cfgs = Vec::new();
        let mut others = Vec::new();
        for attribute in function.attrs {
            let path = attribute.path();
            if path.is_ident("doc") {
                docs.push(attribute);
            } else if path.is_ident("cfg") || path.is_ident("cfg_attr") {
                cfgs.push(attribute);
            } else {
                others.push(attribute);
            }
        }
        Ok(HandlerFn {
            docs,
            cfgs,
            others,
            vis: function.vis,
            sig: function.sig,
            block: function.block,
        })
    }

    pub(crate) fn ident(&self) -> &Ident {
        &self.sig.ident
    }

    /// `#[cfg]`s to repeat on every generated item.
    pub(crate) fn cfgs(&self) -> &[Attribute] {
        &self.cfgs
    }

    /// The parameters, in order (a receiver was rejected by [`HandlerFn::parse`]).
    pub(crate) fn params(&self) -> Vec<&PatType> {
        self.sig
            .inputs
            .iter()
            .filter_map(|input| match input {
                FnArg::Typed(param) => Some(param),
                FnArg::Receiver(_) => None,
            })
            .collect()
    }

    /// The checks both attributes share: `async`, not `unsafe`, not generic.
    pub(crate) fn check_shape(&self, attr: &str, errors: &mut Errors) {
        let sig = &self.sig;
        if sig.asyncness.is_none() {
            errors.at(
                sig.fn_token.span,
                format!(
                    "#[{attr}] requires an async fn: write `async fn {}(...)`",
                    sig.ident
                ),
            );
        }
        if let Some(unsafety) = &sig.unsafety {
            errors.at(
                unsafety.span,
                format!(
                    "a #[{attr}] fn cannot be `unsafe`: the scheduler calls it as a safe fn \
                     (use `unsafe` blocks in the body)"
                ),
            );
        }
        if !sig.generics.params.is_empty() {
            errors.spanned(
                &sig.generics,
                format!(
                    "a #[{attr}] fn cannot have generic or lifetime parameters: the scheduler \
                     calls it with concrete types"
                ),
            );
        } else if let Some(where_clause) = &sig.generics.where_clause {
            errors.spanned(
                where_clause,
                format!("a #[{attr}] fn cannot have a `where` clause"),
            );
        }
    }

    /// The struct with the user's docs, and `impl <name> { <vis> async fn run(..) {..} }`
    /// with the user's signature and body (their spans kept).
    pub(crate) fn item(&self, attr: &str) -> TokenStream {
        let HandlerFn {
            docs,
            cfgs,
            others,
            vis,
            sig,
            block,
        } = self;
        let ident = &sig.ident;
        let mut run = sig.clone();
        run.ident = Ident::new("run", ident.span());
        let run_doc = format!(" Runs the body of the `#[{attr}]` function `{ident}`.");
        quote! {
            #(#cfgs)*
            #(#docs)*
            #[allow(non_camel_case_types)]
            #[derive(Clone, Copy, Debug, Default)]
            #vis struct #ident;

            #(#cfgs)*
            impl #ident {
                #[doc = #run_doc]
                // `async` is required by the attribute, even for a body without `.await`.
                #[allow(clippy::unused_async)]
                #(#others)*
                #vis #run #block
            }
        }
    }
}

/// The context parameter must be the context type itself (not a reference or `impl Trait`):
/// `context` is "forge::CronContext" or "forge::JobContext".
pub(crate) fn check_context_type(ty: &Type, attr: &str, context: &str, errors: &mut Errors) {
    if matches!(ty, Type::ImplTrait(_) | Type::Reference(_)) {
        errors.spanned(
            ty,
            format!("the context of a #[{attr}] fn is passed by value: write `ctx: {context}`"),
        );
    }
}

/// The job's arguments type must be a type the generated code can name and own. Whether it
/// is.
pub(crate) fn check_args_type(ty: &Type, errors: &mut Errors) -> bool {
    match ty {
        Type::ImplTrait(_) => errors.spanned(
            ty,
            "a #[job] fn needs a concrete type for its arguments, not `impl Trait`",
        ),
        Type::Reference(_) => errors.spanned(
            ty,
            "a #[job] fn needs an owned type for its arguments, not a reference: they are \
             stored as JSON and decoded for each attempt (for example `String` instead of `&str`)",
        ),
        _ => return true,
    }
    false
}
