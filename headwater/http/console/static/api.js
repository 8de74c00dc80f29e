// The /v1 API over fetch(): JSON in and out; an error answer becomes an ApiError carrying
// the API's own name and message (shown to the operator as they are).

export class ApiError extends Error {
  constructor(status, name, message) {
    super(message);
    this.status = status;
    this.name = name;
  }
}

export async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["content-type"] = "application/json";
  }
  let res;
  try {
    res = await fetch("/v1" + path, init);
  } catch (e) {
    throw new ApiError(0, "NetworkError", `the gateway did not answer (${e.message})`);
  }
  if (res.status === 204) return null;
  const text = await res.text();
  let doc;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new ApiError(res.status, `HTTP ${res.status}`, text.slice(0, 300) || res.statusText);
  }
  if (!res.ok) {
    const err = doc.error || {};
    throw new ApiError(res.status, err.name || `HTTP ${res.status}`, err.message || text);
  }
  return doc;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body === undefined ? {} : body);
export const del = (path) => api("DELETE", path);

/** A path segment: a queue, group or id as it goes in a URL. */
export const seg = encodeURIComponent;

/** "?a=1&b=x" of the entries whose value is set. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? "?" + s : "";
}
