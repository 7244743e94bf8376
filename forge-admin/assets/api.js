// The admin API, as the dashboard calls it: relative URLs (so the router may be nested under a
// prefix), JSON both ways, the operator's token as a bearer token. The token lives in this
// tab's sessionStorage only; browsers never attach an Authorization header on their own, so no
// other site can make this browser act with it (no cookies: nothing to forge).

const TOKEN_KEY = 'forge.dashboard.token';

export function token() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  } catch {
    return '';
  }
}

export function setToken(value) {
  try {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // Storage disabled: the token is not kept.
  }
}

/** An answer other than 2xx, or no answer at all (status 0). */
export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
  }
}

/** One request; resolves with the JSON body, rejects with an ApiError. */
export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  const bearer = token();
  if (bearer) headers.Authorization = `Bearer ${bearer}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
    });
  } catch (err) {
    throw new ApiError(0, { error: `the admin API is unreachable (${err.message})` });
  }
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { error: text.slice(0, 300) };
    }
  }
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** A query string from an object, leaving out empty values. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}
