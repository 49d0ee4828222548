"""What a fault is and how it is put on and taken off a host.

This package knows nothing of torch or of the harness: hosts are described by
`chaos.api.Host` (namespace names, interface names, a pid), faults by the frozen value
types in `chaos.faults`, and every side effect is written to a `chaos.ledger.Ledger`
before it happens so that `chaos heal` can undo it after a SIGKILL.
"""
