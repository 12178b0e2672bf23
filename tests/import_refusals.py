"""The importers' refusal texts that the hostile-input tests of every launcher format look for."""

SUBSTITUTION = "a command substitution would have to run a command; nothing is run"
TOO_LARGE = "too large; allowed: text of at most 256 KiB"
FILE_TOO_LARGE = "too large; allowed: a file of at most 256 KiB"  # what the CLI reads (a path, or stdin)
