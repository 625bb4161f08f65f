"""What operators and the system do to the registry: releases, uploads, drills, retention, API keys, audit events."""
