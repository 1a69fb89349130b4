"""Running untrusted code: process groups and timeouts, Landlock, seccomp, the audit hook."""
