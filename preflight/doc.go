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
//   - A content-addressed cache makes a repeat scan of an unchanged tree read
//     no file that was clean; it stores hashes only, never a secret.
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
