// The console's AWS Bedrock account fields (issue #19): what the accounts form sends.

/**
 * An AWS Bedrock account's body parts from the form: settings.region and
 * settings.access_key_id (kept with the account's other settings), and the credential —
 * the secret access key, with ":<session token>" when there is one. Both secrets are
 * write-only: blank keeps what is stored (a new session token needs its secret too).
 */
export function bedrockFields(v, account) {
  const region = (v.aws_region || '').trim();
  const akid = (v.aws_access_key_id || '').trim();
  if (!/^[a-z0-9-]{1,32}$/.test(region)) throw { field: 'aws_region', plain: 'The AWS region, e.g. us-east-1.' };
  if (!/^[A-Z0-9]{1,128}$/.test(akid)) throw { field: 'aws_access_key_id', plain: 'The access key id, e.g. AKIA… (capital letters and digits).' };
  const out = { settings: { ...(account?.settings || {}), region, access_key_id: akid } };
  const secret = v.aws_secret || '', token = (v.aws_session_token || '').trim();
  if (token && !secret) throw { field: 'aws_secret', plain: 'A new session token goes with its secret access key: enter both.' };
  if (secret.includes(':')) throw { field: 'aws_secret', plain: 'A secret access key has no colon.' };
  if (secret) out.credential = token ? `${secret}:${token}` : secret;
  else if (!account?.has_credential) throw { field: 'aws_secret', plain: 'The secret access key is needed to sign requests.' };
  return out;
}
