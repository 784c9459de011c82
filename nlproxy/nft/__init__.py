"""nftables: object model and IR, encoder, transactions, read-back, reconcile."""
