// Exports of the records shown: JSON (the API's record objects, as read) and CSV (one row a
// record, RFC 4180 quoting; properties as a JSON object in one column).

export const CSV_COLUMNS = ["queue", "partition", "offset", "id", "timestamp_ms", "key", "key_encoding", "tag", "properties", "value", "encoding"];

export function toJson(records) {
  return JSON.stringify(records, null, 2) + "\n";
}

function cell(v) {
  if (v === undefined || v === null) return "";
  const s = typeof v === "object" ? JSON.stringify(v) : String(v);
  return /[",\r\n]/.test(s) ? `"${s.replaceAll('"', '""')}"` : s;
}

export function toCsv(records) {
  const lines = [CSV_COLUMNS.join(",")];
  for (const r of records) lines.push(CSV_COLUMNS.map((c) => cell(r[c])).join(","));
  return lines.join("\r\n") + "\r\n";
}
