"""Model files: content-addressed storage, upload staging and the sandboxed inspection."""
