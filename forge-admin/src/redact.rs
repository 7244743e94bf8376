//! The configuration as the API shows it: no password, no token, whatever the shape.

use serde_json::Value;

/// What replaces a secret: the same as in `Debug` and `Display` of the configuration.
pub(crate) use forge_core::config::REDACTED;

/// Hides every secret of a serialized configuration: values of keys that name a secret
/// (`token`, `password`, `secret`, `key` ...) are replaced, and every string that looks like a
/// connection URL or string loses its password ([`forge_core::redact_url`]).
pub(crate) fn redact(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if is_secret_key(key) {
                    if !value.is_null() {
                        *value = Value::String(REDACTED.to_owned());
                    }
                } else {
                    redact(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::String(text) if text.contains("://") || text.contains("password") => {
            *text = forge_core::redact_url(text);
        }
        _ => {}
    }
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "token",
        "password",
        "passwd",
        "secret",
        "credential",
        "api_key",
        "private_key",
    ]
    .iter()
    .any(|word| key.contains(word))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secrets_are_hidden() {
        let mut config = json!({
            "database": { "url": "postgres://app:s3cret@db:5432/app?sslmode=require" },
            "admin": { "token": "0123456789abcdef0123", "read_token": null, "read_only": false },
            "other": [{ "dsn": "host=db password=hunter2 user=app" }, { "api_key": "k" }],
        });
        redact(&mut config);
        let text = config.to_string();
        for secret in ["s3cret", "0123456789abcdef0123", "hunter2", "\"k\""] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(config["admin"]["token"], REDACTED);
        assert_eq!(config["admin"]["read_token"], Value::Null);
        assert_eq!(config["admin"]["read_only"], false);
        assert!(text.contains("postgres://app:***@db:5432/app"), "{text}");
    }
}
