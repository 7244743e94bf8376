//! Pages of a read model, newest first, with a cursor.

use serde::Serialize;

/// A page of results, newest first, and the cursor of the next (older) page.
#[derive(Clone, Debug, Serialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass as [`PageRequest::before`] for the next page; `None` on the last page.
    pub next: Option<i64>,
}

/// Which page to read: at most `limit` items (1..=500) older than the cursor `before`.
#[derive(Clone, Copy, Debug)]
pub struct PageRequest {
    /// Items per page.
    pub limit: u32,
    /// The cursor from the previous page's [`Page::next`]; `None` for the newest page.
    pub before: Option<i64>,
}

impl Default for PageRequest {
    fn default() -> Self {
        PageRequest {
            limit: 50,
            before: None,
        }
    }
}

impl PageRequest {
    /// The newest `limit` items.
    pub fn first(limit: u32) -> PageRequest {
        PageRequest {
            limit,
            before: None,
        }
    }

    fn limit(&self) -> i64 {
        i64::from(self.limit.clamp(1, 500))
    }

    /// Builds the page from one more row than asked for: its presence means there is more.
    pub fn page<T>(&self, mut items: Vec<T>, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let more = items.len() as i64 > self.limit();
        items.truncate(self.limit() as usize);
        let next = more.then(|| items.last().map(&cursor)).flatten();
        Page { items, next }
    }

    /// The SQL `LIMIT` to use: one more than the page holds.
    pub fn fetch(&self) -> i64 {
        self.limit() + 1
    }
}
