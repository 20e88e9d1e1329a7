"""What the proxy and the load generator share: the recorder (timeline, attribution, records) and its IO."""
