module expertpack

go 1.19
