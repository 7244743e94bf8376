//! Types that cross the Rust/SQL boundary as text or `bigint`, so that queries bind and read
//! them directly (`.bind(epoch)`, a `JobState` field of a `#[derive(sqlx::FromRow)]` row) and
//! no state is exchanged as a free-form string; and [`Lenient`], a column that may not decode.
//!
//! [`sql_enum!`](crate::sql_enum) declares an enum whose variants are the values of a SQL
//! `CHECK (... IN (...))` list; each such enum has a test comparing `ALL` with the list in the
//! database.

/// Declares an enum stored as `text`: `as_str`, `parse`, `ALL`, `Display`, and sqlx's
/// `Type`/`Encode`/`Decode` for PostgreSQL.
///
/// ```
/// forge_core::sql_enum! {
///     /// A light's colour.
///     pub enum Colour {
///         /// Stop.
///         Red = "red",
///         /// Go.
///         Green = "green",
///     }
/// }
/// assert_eq!(Colour::parse("red"), Some(Colour::Red));
/// assert_eq!(Colour::ALL.len(), 2);
/// ```
#[macro_export]
macro_rules! sql_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every value, in declaration order (the SQL `CHECK` list).
            pub const ALL: &'static [$name] = &[ $( $name::$variant ),+ ];

            /// The value as stored in the database.
            pub const fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $text ),+ }
            }

            /// Parses a stored value.
            pub fn parse(text: &str) -> ::core::option::Option<$name> {
                match text { $( $text => ::core::option::Option::Some($name::$variant), )+ _ => ::core::option::Option::None }
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        $crate::sql_text_type!($name, |text: &str| {
            $name::parse(text).ok_or_else(|| {
                format!("unknown {} {:?} in the database", stringify!($name), text)
            })
        });
    };
}

/// Implements sqlx's `Type`/`Encode`/`Decode` for a newtype over `i64` (`bigint`).
#[doc(hidden)]
#[macro_export]
macro_rules! sql_bigint_newtype {
    ($name:ident) => {
        impl ::sqlx::Type<::sqlx::Postgres> for $name {
            fn type_info() -> ::sqlx::postgres::PgTypeInfo {
                <i64 as ::sqlx::Type<::sqlx::Postgres>>::type_info()
            }
        }

        impl ::sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <i64 as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl ::sqlx::Encode<'_, ::sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut ::sqlx::postgres::PgArgumentBuffer,
            ) -> ::core::result::Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                <i64 as ::sqlx::Encode<::sqlx::Postgres>>::encode_by_ref(&self.0, buf)
            }
        }

        impl ::sqlx::Decode<'_, ::sqlx::Postgres> for $name {
            fn decode(
                value: ::sqlx::postgres::PgValueRef<'_>,
            ) -> ::core::result::Result<$name, ::sqlx::error::BoxDynError> {
                Ok($name(<i64 as ::sqlx::Decode<::sqlx::Postgres>>::decode(
                    value,
                )?))
            }
        }
    };
}

/// Implements sqlx's `Type`/`Encode`/`Decode` for a type stored as `text`, given `as_str()`
/// and a `TryFrom<&str>`-like constructor.
#[doc(hidden)]
#[macro_export]
macro_rules! sql_text_type {
    ($name:ty, $parse:expr) => {
        impl ::sqlx::Type<::sqlx::Postgres> for $name {
            fn type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::type_info()
            }
            fn compatible(ty: &::sqlx::postgres::PgTypeInfo) -> bool {
                <&str as ::sqlx::Type<::sqlx::Postgres>>::compatible(ty)
            }
        }

        impl ::sqlx::postgres::PgHasArrayType for $name {
            fn array_type_info() -> ::sqlx::postgres::PgTypeInfo {
                <&str as ::sqlx::postgres::PgHasArrayType>::array_type_info()
            }
        }

        impl ::sqlx::Encode<'_, ::sqlx::Postgres> for $name {
            fn encode_by_ref(
                &self,
                buf: &mut ::sqlx::postgres::PgArgumentBuffer,
            ) -> ::core::result::Result<::sqlx::encode::IsNull, ::sqlx::error::BoxDynError> {
                <&str as ::sqlx::Encode<::sqlx::Postgres>>::encode_by_ref(&self.as_str(), buf)
            }
        }

        impl ::sqlx::Decode<'_, ::sqlx::Postgres> for $name {
            fn decode(
                value: ::sqlx::postgres::PgValueRef<'_>,
            ) -> ::core::result::Result<$name, ::sqlx::error::BoxDynError> {
                let text = <&str as ::sqlx::Decode<::sqlx::Postgres>>::decode(value)?;
                #[allow(clippy::redundant_closure_call)]
                ($parse)(text).map_err(|err| err.to_string().into())
            }
        }
    };
}

pub(crate) use crate::sql_text_type;

/// A column read without failing its row (a field of a `#[derive(sqlx::FromRow)]` row): `Err`
/// says why its value did not decode - a type it does not have, a NULL, a value out of range,
/// or (with `#[sqlx(default)]` on the field) a column the row does not have.
///
/// For rows whose every column is not essential: the answer of a SQL function that a newer
/// node may have replaced during a rolling upgrade (an older node skips what it does not
/// understand rather than fail the whole answer), a job's arguments (arguments that do not
/// decode dead-letter their job, not their batch), diagnostics.
#[derive(Debug)]
pub struct Lenient<T>(pub Result<T, sqlx::error::BoxDynError>);

impl<T> Lenient<T> {
    /// The value, if it decoded.
    pub fn ok(self) -> Option<T> {
        self.0.ok()
    }
}

impl<T: Default> Lenient<T> {
    /// The value, or `T`'s default if it did not decode.
    pub fn or_default(self) -> T {
        self.0.unwrap_or_default()
    }
}

/// A missing column (what `#[sqlx(default)]` gives).
impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(Err("no such column".into()))
    }
}

impl<T: sqlx::Type<sqlx::Postgres>> sqlx::Type<sqlx::Postgres> for Lenient<T> {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        T::type_info()
    }

    /// Any: [`Lenient`]'s `decode` checks the type itself, so a mismatch fails the value, not
    /// the row.
    fn compatible(_: &sqlx::postgres::PgTypeInfo) -> bool {
        true
    }
}

impl<'r, T> sqlx::Decode<'r, sqlx::Postgres> for Lenient<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        use sqlx::{TypeInfo, ValueRef};
        // The check `Row::try_get` makes before decoding.
        if !value.is_null() {
            let ty = value.type_info();
            if !ty.is_null() && !T::compatible(&ty) {
                let mismatch = sqlx::error::mismatched_types::<sqlx::Postgres, T>(&ty);
                return Ok(Lenient(Err(mismatch)));
            }
        }
        Ok(Lenient(T::decode(value)))
    }
}

/// The values of a `CHECK (column IN (...))` constraint, to compare with an enum's `ALL` in
/// tests: `check_values(&pool, "forge.cron_ticks", "state")`. For a table partitioned by a list
/// of the column's values (`forge.jobs` by `state`), the values its partitions admit, partition
/// by partition.
pub async fn check_values(
    executor: impl sqlx::Executor<'_, Database = sqlx::Postgres>,
    table: &str,
    column: &str,
) -> Result<Vec<String>, sqlx::Error> {
    // pg_get_constraintdef gives "CHECK ((state = ANY (ARRAY['a'::text, 'b'::text])))".
    // A partition's bound gives "FOR VALUES IN ('a', 'b')".
    let definition: Option<String> = sqlx::query_scalar(
        "SELECT coalesce(
                    (SELECT pg_get_constraintdef(c.oid)
                       FROM pg_constraint c
                       JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
                      WHERE c.conrelid = $1::regclass AND c.contype = 'c' AND a.attname = $2
                      LIMIT 1),
                    (SELECT string_agg(pg_get_expr(p.relpartbound, p.oid), ' ' ORDER BY p.oid)
                       FROM pg_partitioned_table t
                       JOIN pg_attribute a ON a.attrelid = t.partrelid AND a.attnum = t.partattrs[0]
                       JOIN pg_inherits i ON i.inhparent = t.partrelid
                       JOIN pg_class p ON p.oid = i.inhrelid
                      WHERE t.partrelid = $1::regclass AND t.partstrat = 'l' AND a.attname = $2))",
    )
    .bind(table)
    .bind(column)
    .fetch_optional(executor)
    .await?;
    let definition = definition.unwrap_or_default();
    Ok(definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect())
}
