"""The call lifecycle both data planes share: intake, admission, placement, attempts and their rows."""
