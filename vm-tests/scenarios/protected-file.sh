# a file the host's git obeys (.gitattributes names the filters git runs) is read-only inside
# expect: blocked
printf '* filter=evil\n' >> .gitattributes
