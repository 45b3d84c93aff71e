package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		text, want string
	}{
		{"Apache License\nVersion 2.0, January 2004\nTERMS AND CONDITIONS", "Apache-2.0"},
		{"Mozilla Public License, version 2.0\n1. Definitions", "MPL-2.0"},
		{"MIT License\nPermission is hereby granted, free of charge, to any person", "Expat"},
		{"#### MIT License ####\nPermission is hereby granted, free of charge\n#### Apache License ####\nLicensed under the Apache License, Version 2.0", "Expat and Apache-2.0"},
		{"Redistribution and use in source and binary forms, with or without\n* Neither the name of Google Inc. nor", "BSD-3-clause"},
		{"Redistribution and use in source and binary forms, with or without\n2. Redistributions in binary form", "BSD-2-clause"},
		{"All rights reserved. Do not copy.", ""},
	}
	for _, tc := range tests {
		got, err := classify(tc.text)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("classify(%.30q) = %q, %v; want %q", tc.text, got, err, tc.want)
		}
	}
}

func TestCopyrightLines(t *testing.T) {
	text := `Copyright (c) 2016 Caleb Spare
   Copyright 2009 The Go Authors.
Copyright © 2020 Someone
COPYRIGHT (C) 2013 Blake Mizerany
      "Licensor" shall mean the copyright owner or entity authorized by
   Copyright [yyyy] [name of copyright owner]
   Copyright {yyyy} {name of copyright owner}
copyright staring in 2011 when the project was ported over:
Copyright notice and this permission notice shall be included
`
	want := []string{"(c) 2016 Caleb Spare", "2009 The Go Authors.", "© 2020 Someone", "(C) 2013 Blake Mizerany"}
	if got := copyrightLines(text); !slices.Equal(got, want) {
		t.Errorf("copyrightLines = %q, want %q", got, want)
	}
}

// TestWrite: the paragraphs are DEP-5: a license without a common copy
// inline, with " ." for its empty lines; a common one named, with a
// standalone paragraph where the head has none.
func TestWrite(t *testing.T) {
	head := "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\nFiles: *\nCopyright: 2026 us\nLicense: Apache-2.0\n\nLicense: Apache-2.0\n see /usr/share/common-licenses/Apache-2.0\n"
	parts := []part{
		{files: "example.com/a/*", copyright: []string{"2020 A", "2021 B"}, license: "Expat", text: "Permission is granted.\n\nNo warranty.\n", comment: "example.com/a v1.0.0."},
		{files: "example.com/b/*", copyright: []string{"2014 C"}, license: "MPL-2.0", comment: "example.com/b v2.0.0."},
		{files: "example.com/c/*", copyright: []string{"2015 D"}, license: "Apache-2.0", comment: "example.com/c v3.0.0."},
	}
	var b bytes.Buffer
	if err := write(&b, []byte(head), parts); err != nil {
		t.Fatal(err)
	}
	want := head + `
Files: example.com/a/*
Copyright: 2020 A
 2021 B
License: Expat
 Permission is granted.
 .
 No warranty.
Comment: example.com/a v1.0.0.

Files: example.com/b/*
Copyright: 2014 C
License: MPL-2.0
Comment: example.com/b v2.0.0.

Files: example.com/c/*
Copyright: 2015 D
License: Apache-2.0
Comment: example.com/c v3.0.0.

License: MPL-2.0
 On Debian systems, the complete text of this license can be found in
 "/usr/share/common-licenses/MPL-2.0".
`
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestReadPart reads a module as the module cache holds it.
func TestReadPart(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "LICENSE.txt"), []byte("Copyright (c) 2016 Caleb Spare\n\nPermission is hereby granted, free of charge, to any person\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "NOTICE"), []byte("Product X\nCopyright 2018 Y, Inc\n"), 0o644)
	p, err := readPart(dir, "example.com/x/*", "example.com/x v1.")
	if err != nil {
		t.Fatal(err)
	}
	if p.license != "Expat" || !slices.Equal(p.copyright, []string{"(c) 2016 Caleb Spare", "2018 Y, Inc"}) ||
		!strings.Contains(p.text, "Permission is hereby granted") || !strings.Contains(p.comment, "Its NOTICE:\n\nProduct X\n") {
		t.Errorf("readPart: %+v", p)
	}
	if _, err := readPart(t.TempDir(), "example.com/y/*", ""); err == nil {
		t.Error("readPart of a tree without a license: no error")
	}
	if got := escapePath("github.com/BurntSushi/toml"); got != "github.com/!burnt!sushi/toml" {
		t.Errorf("escapePath: %q", got)
	}
}
