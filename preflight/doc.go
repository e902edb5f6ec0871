// Package preflight scans a workspace for secrets with gitleaks before the
// VM starts, classifies each finding by risk, and lets the user decide
// what happens to it.
//
// What it does:
//
//   - Scan runs gitleaks' default rules, extended by a user TOML file with
//     `[extend] useDefault = true` semantics, over every regular file of the
//     workspace: files git ignores are scanned (.env files are what matters),
//     .git is skipped, global gitleaks path allowlists (node_modules/, lock
//     files …) are honoured, symlinks are never followed (a link inside the
//     workspace is scanned at its target's own path; a link out points at
//     something the VM cannot reach either), FIFOs, sockets and devices are
//     never opened, binary files (a NUL byte in the first 8000) and files
//     over Options.MaxFileSize (10 MiB by default) are checked by path rules
//     only and the large ones are listed in Report.Skipped. Files are scanned
//     by one worker per core, each with its own detector over one shared,
//     read-only rule set.
//   - Each finding gets a Risk and a Reason (see classify for the precise
//     rules), and a Status: ignored (.gitleaksignore), approved
//     (.vibedom/approved_secrets.txt) or unapproved.
//   - Review prints the unapproved findings grouped by risk and asks
//     continue / approve all / approve some / cancel on a terminal, or applies
//     the warn, strict or off policy without one.
//   - A content-addressed cache of clean verdicts (keyed by the bytes and
//     the path, under one rule set) makes a repeat scan of an unchanged tree
//     run the rules over no clean file; on a local file system a stat memo
//     (size, mtime, ctime, inode, device) also spares reading them. It
//     stores hashes only, never a secret.
//   - Approvals are keyed hashes under a per-user key; a line of the
//     approvals file approves at most the file, rule and secret it names,
//     and without a usable key nothing is approved (the scan still runs).
//   - Report.Secrets hands the plaintext values to the DLP, in memory only;
//     Report.WriteJSON writes them redacted.
//
// What it does not do: it does not scan git history, does not descend into
// archives, does not verify whether a secret is live, and does not stop the
// agent from reading an approved secret — approval means "the agent may see
// it"; the DLP still scrubs it from traffic.
//
// The package is silent unless given a logger, and it turns gitleaks' own
// global logger off (its trace messages carry secret values).
package preflight
