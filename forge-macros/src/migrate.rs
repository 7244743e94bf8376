//! `forge::migrate!("migrations")`: the application's migrations embedded at compile time, for
//! `NodeBuilder::migrations`, without a dependency on sqlx's macros.
//!
//! The folder is read when the crate compiles (relative to its `Cargo.toml`), with sqlx's
//! rules: `<VERSION>_<DESCRIPTION>.sql` (or `.up.sql` / `.down.sql`), other files ignored, a
//! version that is not an integer an error. Each file is included with `include_str!`, so a
//! changed migration rebuilds the crate; a new file needs a rebuild (a build script's
//! `cargo:rerun-if-changed=migrations` does it).

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::LitStr;

pub(crate) fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let folder: LitStr = if input.is_empty() {
        LitStr::new("migrations", Span::call_site())
    } else {
        syn::parse2(input)?
    };
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .ok_or_else(|| {
            syn::Error::new(
                folder.span(),
                "CARGO_MANIFEST_DIR is not set: build with cargo",
            )
        })?;
    let dir = root.join(folder.value());
    let entries = std::fs::read_dir(&dir).map_err(|err| {
        syn::Error::new(
            folder.span(),
            format!("cannot read the migrations folder {}: {err}", dir.display()),
        )
    })?;
    let mut migrations = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| syn::Error::new(folder.span(), err.to_string()))?;
        let path = entry.path();
        if !path.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((version, rest)) = name.split_once('_') else {
            continue;
        };
        if !rest.ends_with(".sql") {
            continue;
        }
        let version: i64 = version.parse().map_err(|_| {
            syn::Error::new(
                folder.span(),
                format!("migration {name:?}: the name must start with an integer version, as in `0001_create_orders.sql`"),
            )
        })?;
        let (kind, description) = if let Some(d) = rest.strip_suffix(".up.sql") {
            ("up", d)
        } else if let Some(d) = rest.strip_suffix(".down.sql") {
            ("down", d)
        } else {
            ("simple", rest.trim_end_matches(".sql"))
        };
        let description = description.replace('_', " ");
        let path = path
            .canonicalize()
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        migrations.push((version, kind, description, path));
    }
    migrations.sort();
    let items = migrations.iter().map(|(version, kind, description, path)| {
        quote! {
            ::forge::__private::migration(#version, #description, #kind, ::core::include_str!(#path))
        }
    });
    Ok(quote! {
        ::forge::__private::migrator(::std::vec![#(#items),*])
    })
}
