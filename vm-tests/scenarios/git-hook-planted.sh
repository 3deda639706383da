# a hook planted in the project's .git/hooks (the host's next commit would run it)
# expect: blocked
printf '#!/bin/sh\ntouch /tmp/pwned\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit
