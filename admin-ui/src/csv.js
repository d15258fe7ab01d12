// CSV export of usage rows, done in the browser (RFC 4180: fields with a comma, quote
// or line break are quoted, quotes doubled). Cells that a spreadsheet would run as a
// formula (starting with = + - @) are prefixed with a quote so an exported model name
// cannot execute anything when the file is opened.

export const USAGE_COLUMNS = [
  'id', 'created_at', 'request_id', 'tenant_id', 'api_key_id', 'group_id', 'account_id', 'model',
  'status', 'attempts', 'input_tokens', 'output_tokens', 'cache_read_tokens', 'cache_write_tokens',
  'reasoning_tokens', 'cost', 'estimated', 'ttft_ms', 'total_ms', 'tenant', 'key', 'account',
];

export function csvCell(v) {
  if (v === null || v === undefined) return '';
  let s = typeof v === 'object' ? JSON.stringify(v) : String(v);
  if (typeof v === 'string' && /^[=+\-@\t\r]/.test(s)) s = `'${s}`;
  return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
}

export function toCsv(rows, columns = USAGE_COLUMNS) {
  const lines = [columns.join(',')];
  for (const r of rows) lines.push(columns.map((c) => csvCell(r[c])).join(','));
  return `${lines.join('\r\n')}\r\n`;
}
