"""The mutating admission webhook, hosted in a Kopf operator."""
