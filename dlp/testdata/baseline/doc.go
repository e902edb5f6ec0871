// Package baseline is a frozen copy of package dlp as issue 23 found it
// (main 8cf0a9f), kept for BenchmarkScrub1MBJSON and
// BenchmarkScrub64KBLatency to compare against in the same run. Nothing
// else imports it; it is not maintained.
//
// It scrubs secrets and personal data from what the agent sends
// out. It is a pure engine: it reads no network, keeps no state between
// requests, and never logs a value it finds.
//
// What it finds:
//
//   - Known values: every secret the preflight found and the secret-like
//     values of the workspace's .env files (see EnvSecrets), in their raw
//     form and as the encodings an exfiltration would use: base64 (standard
//     and URL alphabets, each of the three byte alignments, so a secret
//     inside a larger encoded blob is found too), hex (both cases),
//     percent-encoding and JSON string escapes. All of them are matched in
//     one pass over the text, whatever their number (a hashed 8-byte
//     window, not a loop of regular expressions). Where the text shows a
//     formatting (line-wrapped base64 or hex, mixed-case hex, JSON
//     escapes, %XX, quoted-printable), the region around it is rendered
//     with it undone and searched again (views.go). Each secret-like line
//     of a multi-line value is matched on its own too.
//   - Recognizers, each redacting the secret value and not the keyword in
//     front of it: cloud keys (AWS, GCP), service tokens (GitHub, GitLab,
//     Slack, Stripe, Anthropic, OpenAI, npm, Hugging Face), bearer and
//     basic credentials, JWTs, whole PEM private-key blocks and age keys,
//     the password of a URL's user:password@, `key = value` assignments of
//     high-entropy values to secret-sounding names, e-mail addresses (RFC
//     2606 names exempt), credit-card numbers (Luhn-checked), private IPv4
//     addresses and, for public destinations, the user name in home
//     directory paths, US SSNs, IBANs (mod-97) and phone numbers. The
//     rules of the gitleaks compiled in run on traffic too, anchored on
//     their keywords. Placeholders (sk-ant-xxxx…, …EXAMPLE) are left. The
//     precise rules are in docs/dlp.md.
//
// A new recognizer anchored on a literal (a token prefix, a keyword) is
// one row of the table in recognizers.go: its name, literals, category
// (which is its placeholder's label) and check function; the anchor index
// is derived from the table at init. Recognizers triggered by '@' or by
// digits (addresses, URL credentials, cards, IPs, SSNs, IBANs, phones)
// run in their own passes (scanner.run).
//
// Before scanning it undoes what a sender would use to hide a value: the
// Content-Encoding (gzip, deflate, br, zstd, stacked in any order; gzip,
// zlib and zstd also when no header declares them), JSON
// string escapes (it walks the JSON; bytes it does not change are
// forwarded unchanged and the output stays valid JSON),
// application/x-www-form-urlencoded and URL query encoding, and the text
// parts of multipart bodies. Bodies are streamed with bounded memory: a
// value split across read or chunk boundaries is still found.
//
// What is done with a finding depends on the destination's class
// (external, internal or public, chosen by name pattern) and on the
// allowlists: a category may be redacted, only logged, or let through.
// Each redaction becomes [REDACTED:<CATEGORY>].
//
// What it does not do: it does not decrypt, does not reverse arbitrary
// transformations (a value reversed, split across fields or XORed is not
// found), does not look into non-HTTP traffic, and does not decide which
// destinations are reachable (netfilter's policy does). Its defence is in
// depth behind the allowlist, not instead of it.
package baseline
